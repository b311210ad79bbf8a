"""Where a process stands and how ranks meet, talk and fail: world, clusters, errors, liveness, the process group."""
