"""ralph's engine: the machine, its hooks, the driver loop, agents, channels, CLI, config.

Nothing is imported here: `ralph emit` must start as fast as the bare interpreter.
"""
