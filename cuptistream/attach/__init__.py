"""``cuptistream attach PID``: the probe loaded into a Python process that is already running.

``target`` learns what the process is and whether this user may attach to it; ``inject`` has its
main thread run a small standard-library script (``loader``) at its next safe point, through
``sys.remote_exec`` on CPython 3.14 and through ``ptrace`` (``ptrace``, ``elf``) on 3.10 to 3.13.
The script puts the node install's probe runtime on ``sys.path`` and, on a thread of its own, starts
the probe (``inside``); with ``--for`` it stops the probe again, which finalizes CUPTI, and leaves
the process's threads and file descriptors as they were. ``command`` is the CLI.
"""
