"""Running statistics of observations and returns: exact, mergeable across DDP ranks, refusing bad input."""
