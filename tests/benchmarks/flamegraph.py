"""A flame graph, as an SVG, from folded stacks ("root;child;leaf COUNT" per line: py-spy's
--format raw, or perf's stacks folded): each frame a box as wide as its samples, its callers
below it. Brendan Gregg's layout (flamegraph.pl), written small here because the project's
machines have no Perl FlameGraph; hover a box for its name and share."""

from __future__ import annotations

import html

ROW = 16       # pixels per stack depth
WIDTH = 1200   # pixels for all the samples
MIN_PX = 0.3   # boxes narrower than this are left out (too thin to see)


def parse(folded: str) -> dict[tuple[str, ...], int]:
    stacks: dict[tuple[str, ...], int] = {}
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            key = tuple(stack.split(";"))
            stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


def _tree(stacks: dict[tuple[str, ...], int]) -> dict:
    root = {"name": "all", "count": 0, "children": {}}
    for frames, count in stacks.items():
        root["count"] += count
        node = root
        for frame in frames:
            node = node["children"].setdefault(frame, {"name": frame, "count": 0,
                                                       "children": {}})
            node["count"] += count
    return root


def _colour(name: str) -> str:
    h = sum(map(ord, name)) % 60
    return f"rgb({205 + h // 2},{80 + h * 2},{40 + h // 3})"


def svg(folded: str, title: str) -> str:
    root = _tree(parse(folded))
    total = max(root["count"], 1)
    boxes, depth_max = [], 0

    def place(node, x: float, depth: int) -> None:
        nonlocal depth_max
        width = node["count"] / total * WIDTH
        if width < MIN_PX:
            return
        depth_max = max(depth_max, depth)
        boxes.append((x, depth, width, node["name"], node["count"]))
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            place(child, x, depth + 1)
            x += child["count"] / total * WIDTH

    place(root, 0.0, 0)
    height = (depth_max + 1) * ROW + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           'font-family="monospace" font-size="11">',
           f'<text x="4" y="16" font-size="14">{html.escape(title)}</text>']
    for x, depth, width, name, count in boxes:
        y = height - (depth + 1) * ROW
        label = name if len(name) * 7 < width else name[: max(int(width / 7) - 2, 0)] + ".."
        share = f"{name} ({count} samples, {count / total:.1%})"
        out.append(f'<g><title>{html.escape(share)}</title><rect x="{x:.1f}" y="{y}" '
                   f'width="{width:.1f}" height="{ROW - 1}" fill="{_colour(name)}"/>'
                   + (f'<text x="{x + 2:.1f}" y="{y + ROW - 4}">{html.escape(label)}</text>'
                      if width > 20 else "") + "</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
