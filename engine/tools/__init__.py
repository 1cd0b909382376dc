"""What agents call during their runs (`ralph emit`, `ralph tools ...`, `ralph mcp`): it
runs inside an agent's process tree, so it imports little and speaks to the engine only
through the session's files."""
