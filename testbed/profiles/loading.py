"""Read a profile: from netem_profiles/ by name or from a path, with `--set key=value`
overrides, validated, with errors that name the file, the field path and the fix."""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from testbed import yamlfile
from testbed.errors import UsageError
from testbed.profiles import model

log = logging.getLogger(__name__)
PROFILES_DIR_ENV = "LOSSBED_PROFILES_DIR"
# what sets a loss rate (--loss sets it too); a burst's length or a correlation does not
LOSS_RATE_KEYS = {"loss", "loss_pct", "p_pct", "r_pct", "loss_in_good_pct", "loss_in_bad_pct"}
LOSS_FIELDS = {
    name for cls in (model.Bernoulli, model.GilbertElliott, model.FourState)
    for name in cls.model_fields if name != "model"
}


class ProfileError(UsageError):
    """A profile that cannot be used, with every problem found, one per line."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        Exception.__init__(self, f"profile {source}:\n  " + "\n  ".join(problems))
        self.field, self.problem, self.fix = source, "; ".join(problems), ""


def profiles_dir() -> Path:
    return Path(os.environ.get(PROFILES_DIR_ENV, Path(__file__).resolve().parents[2]
                               / "netem_profiles"))


def available() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def find(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not path.is_file():
            raise UsageError("PROFILE", f"no profile file {path}",
                             f"Give a path that exists, or one of: {', '.join(available())}")
        return path
    candidate = profiles_dir() / f"{name_or_path}.yaml"
    if not candidate.is_file():
        close = difflib.get_close_matches(name_or_path, available(), n=1)
        hint = f"Did you mean {close[0]}? " if close else ""
        raise UsageError("PROFILE", f"no profile named {name_or_path!r} in {profiles_dir()}",
                         f"{hint}Available: {', '.join(available())}")
    return candidate


def load(name_or_path: str, overrides: list[str] = (), *, loss: float | None = None,
         loss_seed: int | None = None, isolated: bool = False) -> model.Profile:
    """The profile, with `--set` overrides (text, as a user typed them), then the values a
    command passes typed: `loss` (a fraction on every path, Profile.with_loss; 0: no loss
    anywhere, Profile.without_loss; None: the profile's own rates) and its `loss_seed`, and
    `isolated` (the run's datagrams go unsealed)."""
    if loss is not None:  # one loss rate, said once: --loss, or the profile's own, not both
        setting = [item.partition("=")[0].strip() for item in overrides
                   if {*item.partition("=")[0].strip().split(".")} & LOSS_RATE_KEYS]
        if setting:
            raise UsageError("--set", f"{setting[0]} sets the loss that --loss {loss:g} "
                             "sets too: one of them would be dropped",
                             "Give --loss alone (a fraction), or --set "
                             f"{setting[0]}=... without --loss")
    profile = _load(name_or_path, overrides)
    if loss == 0:
        profile = profile.without_loss()
    elif loss is not None:
        try:
            profile = profile.with_loss(loss, loss_seed)
        except ValueError as err:
            raise ProfileError(f"{profile.name} at a loss of {loss:g}", [str(err)]) from None
    if isolated:
        profile = profile.model_copy(update={"isolated": True})
    return profile


def _load(name_or_path: str, overrides: list[str]) -> model.Profile:
    path = find(name_or_path)
    source = f"{path.stem} ({path})"
    try:
        data = yamlfile.read(path)
    except yamlfile.YamlInputError as err:
        raise ProfileError(source, [str(err)]) from None
    if not isinstance(data, dict):
        raise ProfileError(source, ["the file must be a mapping (key: value lines)"])
    data.setdefault("name", path.stem)
    for item in overrides:
        apply_override(data, item)
    return validate(data, source)


def validate(data: dict, source: str) -> model.Profile:
    try:
        return model.Profile.model_validate(data)
    except ValidationError as err:
        raise ProfileError(source, [_explain(e) for e in err.errors()]) from None


def apply_override(data: dict, item: str) -> None:
    """`--set key=value`. The value is read as YAML (10, true, 5000-5100, {a: 1}). Keys:
    a dotted path (impairment.delay_ms, hosts.h1.loss.loss_pct), or a short name: a field of
    the default impairment (delay_ms) or of its loss model (loss_pct, mean_burst_packets).
    `loss_pct` on a profile without loss adds Bernoulli loss."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError("--set", f"{item!r} is not key=value", "Write e.g. --set loss_pct=10")
    if len(text) > 10_000:
        raise UsageError("--set", f"the value of {key} is {len(text):,} characters long",
                         "Write a long value into a profile file instead")
    try:
        value = yamlfile.parse(text) if text.strip() else None
    except yamlfile.YamlInputError as err:
        if "not valid YAML" not in str(err):
            raise UsageError("--set", f"the value of {key}: {err}", "Give a plain value") \
                from None
        value = text
    path = key.split(".")
    if len(path) == 1 and key not in model.Profile.model_fields:
        if key in LOSS_FIELDS:
            impairment = data.setdefault("impairment", {}) or {}
            data["impairment"] = impairment
            loss = impairment.get("loss")
            if loss is None:
                if key != "loss_pct":
                    raise UsageError("--set", f"{key} needs a loss model, and the profile has none",
                                     "Set loss_pct (Bernoulli), or impairment.loss={model: ...}")
                impairment["loss"] = loss = {"model": "bernoulli"}
            path = ["impairment", "loss", key]
        else:
            path = ["impairment", key]
    node = data
    for part in path[:-1]:
        child = node.get(part) if isinstance(node, dict) else None
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UsageError("--set", f"{'.'.join(path[:-1])} is not a mapping in this profile",
                             "Set the whole value instead")
        node = child
    node[path[-1]] = value
    if path[-1] == "loss_pct" and isinstance(value, int | float) and 0 < value < 1:
        log.warning("loss_pct=%g is %g%% (loss_pct is a percent, as in profile files); a "
                    "loss of %g%% is --loss %g. Taken as %g%%", value, value, value * 100,
                    value, value)


_LOSS_TAGS = {"bernoulli": model.Bernoulli, "gilbert_elliott": model.GilbertElliott,
              "four_state": model.FourState}


def _model_at(parts: tuple) -> type[BaseModel] | None:
    """The model class that holds the field at `parts` (a pydantic error location)."""
    import typing

    current: Any = model.Profile
    expect_key = False  # the previous field was a dict: this part is one of its keys
    for part in parts[:-1]:
        if part in _LOSS_TAGS:
            current = _LOSS_TAGS[part]
            continue
        if expect_key or isinstance(part, int) or not (
                isinstance(current, type) and issubclass(current, BaseModel)):
            expect_key = False
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        # Unwrap Optional[...], list[...], dict[str, ...] down to a model class.
        candidates = [field.annotation]
        found = None
        while candidates:
            ann = candidates.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                found = ann
                break
            candidates.extend(a for a in typing.get_args(ann) if a is not type(None))
        current = found
        expect_key = typing.get_origin(field.annotation) is dict
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _loc(parts: tuple) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("bernoulli", "gilbert_elliott", "four_state", "function-after",
                      "function-before"):
            continue  # pydantic's union/validator branch names, not the user's keys
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _explain(error: dict) -> str:
    where = _loc(error["loc"])
    kind = error["type"]
    given = error.get("input")
    if kind == "extra_forbidden":
        key = str(error["loc"][-1])[:60]
        owner = _model_at(error["loc"])
        allowed = sorted(owner.model_fields) if owner else []
        close = difflib.get_close_matches(key, allowed, n=1)
        if close and close[0].startswith(key + "_"):
            hint = f": did you mean {close[0]}? (units are part of the name)"
        elif close:
            hint = f": did you mean {close[0]}?"
        else:
            hint = f". Allowed here: {', '.join(allowed)}" if allowed else ""
        owners = [tag for tag, cls in _LOSS_TAGS.items() if key in cls.model_fields]
        if owners and owner in _LOSS_TAGS.values():
            hint += f" ({key} belongs to loss model {' / '.join(owners)})"
        return f"{where}: unknown key {key!r}{hint}"
    if kind in ("float_parsing", "int_parsing", "float_type", "int_type"):
        fix = ""
        if isinstance(given, str) and given.strip().endswith("%"):
            number = given.strip().rstrip("%").strip()
            fix = f" Write {number}: the field is already a percent (_pct)"
        elif isinstance(given, str) and any(ch.isalpha() for ch in given):
            fix = " Write the number alone: the unit is in the field name"
        return f"{where}: expected a number, got {_short(given)}.{fix}"
    if error["loc"][-1:] == ("loss",) and isinstance(given, int | float) and not isinstance(
            given, bool):
        return (f"{where}: a loss model, not a number (got {_short(given)}). Write "
                f"loss: {{model: bernoulli, loss_pct: {_pct_of(given)}}} (loss_pct is a "
                f"percent), or keep the profile's model and give --loss {_fraction_of(given)} "
                "on the command line (a fraction)")
    message = error["msg"].removeprefix("Value error, ")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        field = str(error["loc"][-1])
        why = f": {model.LIMITS[field]}" if field in model.LIMITS else ""
        return f"{where}: {message} (got {_short(given)}){why}"
    if kind == "finite_number":
        return f"{where}: must be a finite number (got {_short(given)})"
    if given is not None and kind in ("int_from_float", "int_type", "int_parsing",
                                      "float_type", "bool_parsing", "string_type",
                                      "literal_error"):
        return f"{where}: {message} (got {_short(given)})"
    return f"{where}: {message}"


def _pct_of(value: float) -> str:
    """What a bare loss number most likely meant, as loss_pct: a fraction below 1."""
    return f"{value * 100:g}" if 0 < value < 1 else f"{value:g}"


def _fraction_of(value: float) -> str:
    return f"{value:g}" if 0 < value < 1 else f"{value / 100:g}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"
