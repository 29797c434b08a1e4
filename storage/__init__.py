"""Where a run's files live when its parts may run on several hosts: a local folder or a storage URI (`gs://...`).

`storage.uri` is the one home of "a run path that may be a URI"; the driver (orchestration/run_dir.py) and the
learner (checkpoints, the exported adapter) both use it, so it sits beside them, importing neither.
"""
