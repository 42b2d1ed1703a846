"""``make bench``: farm's speed, always side by side with a baseline measured in the same run."""
