"""The daemon's side of runners: scheduling, runner processes, memory and load planning."""
