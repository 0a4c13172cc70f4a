"""The zygote program's process-wide state: ``CONFIG`` (the launcher's JSON argument, read by
:func:`~tasks.sandbox.zygote.zygote_server.main`), ``_STATE`` (what the zygote set up: user
namespace, cgroup base descriptors, template namespace, ...; inherited by every fork) and the
template view's mount points for the per-trial file systems.

Part of the zygote program (see :mod:`tasks.sandbox.zygote`): standard library only.
"""

from __future__ import annotations

CONFIG: dict = {}
_STATE: dict = {}
#: Directories of the template view that sessions mount their own file systems on.
_SCRATCH, _TASK_DIR, _LIB_DIR = "/.scratch", "/task", "/opt/querylab-lib"
