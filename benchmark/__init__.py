"""The benchmark behind onu_benchmark.py: plan (settings, task list), measure (the measurements),
baselines (the loaders compared against), runner (tasks, fresh processes, CPU accounting), report (targets,
tables, PNG)."""
