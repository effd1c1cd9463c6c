"""How a run's training processes are placed: Ray Train for more than one machine (docs/ray.md)."""
