"""Before and around a launch: hostfiles, preflight over ssh, GPU support checks, rank counts."""
