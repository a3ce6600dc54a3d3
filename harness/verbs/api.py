"""pyverbs (rdma-core's Python bindings), found wherever the host has it.

Debian ships pyverbs for its system Python (python3-pyverbs, in /usr/lib/python3/dist-packages),
not on PyPI. The ranks run lossbed's virtual environment's Python, so where the import
fails there and the system's copy was built for this Python version, that directory is put
at the end of the path: the environment's own packages still come first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

SYSTEM_PACKAGES = Path("/usr/lib/python3/dist-packages")


class VerbsMissing(ImportError):
    pass


def load() -> SimpleNamespace:
    """The pyverbs classes lossbed uses; VerbsMissing says what to install if there are none."""
    try:
        return _import()
    except ImportError as first:
        abi = f"cpython-{sys.version_info.major}{sys.version_info.minor}"
        built_here = any((SYSTEM_PACKAGES / "pyverbs").glob(f"device.{abi}*.so"))
        if not built_here or str(SYSTEM_PACKAGES) in sys.path:
            raise VerbsMissing(
                f"pyverbs is missing ({first}) for Python {sys.version_info.major}."
                f"{sys.version_info.minor}: install rdma-core and python3-pyverbs (make "
                "setup-rdma does), built for the Python that runs the ranks") from None
        sys.path.append(str(SYSTEM_PACKAGES))
        try:
            return _import()
        except ImportError as err:
            raise VerbsMissing(f"pyverbs in {SYSTEM_PACKAGES} does not load ({err}): "
                               "reinstall rdma-core and python3-pyverbs") from None


def _import() -> SimpleNamespace:
    import pyverbs.enums as e
    from pyverbs.addr import AH, GID, AHAttr, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR

    return SimpleNamespace(e=e, AH=AH, GID=GID, AHAttr=AHAttr, GlobalRoute=GlobalRoute, CQ=CQ,
                           Context=Context, MR=MR, PD=PD, QP=QP, QPAttr=QPAttr, QPCap=QPCap,
                           QPInitAttr=QPInitAttr, SGE=SGE, RecvWR=RecvWR, SendWR=SendWR)
