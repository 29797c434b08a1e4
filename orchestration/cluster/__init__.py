"""Where a run's parts run: joining or starting Ray, reserving placement groups, each TPU process's libtpu
variables, and the check that the cluster can hold the run (`launch` starts the actors)."""
