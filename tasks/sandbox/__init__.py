"""The sealed ``execute_python`` sandbox: isolation detection, the host side (views, cgroups,
sessions and their pool) and the zygote that forks each cell inside namespaces with dropped
privileges and seccomp. How it isolates a cell: :mod:`tasks.sandbox.session`.

- :mod:`~tasks.sandbox.session` — the entry point: re-exports the names callers use
  (:class:`Sandbox`, :class:`Session`, :func:`shared_sandbox`, :func:`run_validator`, ...);
  ``python -m tasks.sandbox.session`` prints what this machine provides;
- :mod:`~tasks.sandbox.isolation` — the mechanisms (required / optional / resource-only), a
  machine's measured :class:`Isolation`, the sandbox's errors, environment, uid and paths, the
  report lines of a run that lacked a mechanism;
- :mod:`~tasks.sandbox.session_client` — :class:`Session`, the harness's protocol client of one
  session process (files, cells, recycling), and :class:`CellResult`;
- :mod:`~tasks.sandbox.pool` — :class:`Sandbox`: the zygote process, the sessions it forks and
  their warm pool, the isolation probe; this process's :func:`shared_sandbox`;
- :mod:`~tasks.sandbox.validator` — a folder's script (DAB ``validate.py``) in a session of its
  own: :func:`run_in_folder`, :func:`run_validator`;
- :mod:`~tasks.sandbox.host` — what the sandbox takes from the host: the cells' file-system view
  and the cgroup directories;
- :mod:`~tasks.sandbox.zygote` — the program that runs outside querylab's process (zygote,
  sessions, cells): standard-library-only parts joined into the one source passed to
  ``python -I -c``; its framing (:func:`~tasks.sandbox.zygote.send_msg` /
  :func:`~tasks.sandbox.zygote.recv_msg`) is shared with the harness side.
"""
