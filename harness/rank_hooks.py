"""What `lossbed run` installs in each rank of the user's script once the job has joined
(harness.api): an error that ends the rank is named as one mark on stderr (the run's
report and its last line name it); and the job's finish (its metrics, the replicas' drift,
which needs the process group) runs before the script destroys the default process group,
or at exit where it does not."""

from __future__ import annotations

import atexit
import sys

from harness import rank_protocol


def install(rank: int, host: str | None, finish) -> None:
    _install_error_mark(rank, host)
    _finish_before_destroy(finish)
    atexit.register(finish)


def _install_error_mark(rank: int, host: str | None) -> None:
    """An error that ends this rank is named on stderr as one JSON line, then handled as
    before."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        print(rank_protocol.mark(rank_protocol.ERROR_MARK,
                                 {"rank": rank, "host": host,
                                  "error": f"{kind.__name__}: {value}"}),
              file=sys.stderr, flush=True)
        previous(kind, value, traceback)

    sys.excepthook = hook


def _finish_before_destroy(finish) -> None:
    """torch.distributed.destroy_process_group() of the default group (a script's last
    call, as every example's) runs `finish` first, while the group can still carry the
    drift's reliable exchange; finish runs once, so the exit's call does nothing more."""
    import torch.distributed as dist

    original = dist.destroy_process_group
    if getattr(original, "lossbed_finishes", False):
        return

    def destroy_process_group(group=None, *args, **kwargs):
        if group is None:
            finish()
        return original(group, *args, **kwargs)

    destroy_process_group.lossbed_finishes = True
    dist.destroy_process_group = destroy_process_group
