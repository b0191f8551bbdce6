"""The accelerator check (bench/accelerator_check.py, the command): one module per part (``correctness``,
``speed``, ``compilation``, ``end_to_end``), what they share (``common``) and the report (``report``);
and the device machine's tools (``device_check.sh``, ``fetch_wheels.sh``, ``check_wheels``). Importing
the package itself loads nothing (``check_wheels`` runs before the wheels it checks are importable)."""
