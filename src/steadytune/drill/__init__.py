"""Recovery drills: inject real faults into real supervised runs and report what recovered."""
