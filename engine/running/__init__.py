"""Running an agent: one run from its prompt to its outcome (runner), confined
(sandbox), under a supervisor that outlives nothing (supervisor), every process
of it found and stopped (containment, procfs), its requests taken (inlet), and
the lanes of a parallel batch (lanes). Nothing is imported here: the supervisor
runs as `python -E -S -m engine.running.supervisor`, without site-packages."""
