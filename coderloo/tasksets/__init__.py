"""Task sets: the synthetic suite and the benchmark loaders, converted to the one task format (reward_service.tasks)."""
