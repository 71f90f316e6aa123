"""Planning: the instance DP over profiled points. Pure: numbers in, plans out, no processes."""
