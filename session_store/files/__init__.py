"""The file backend: a session's control plane as files under the workspace's state
directory (metadata.yaml, the bus, questions, signals, the lease's lock), woken by a
watcher of its directories. It stands beside postgres/ over the store's shared layer
(session_store/_*.py) and imports nothing of it; session_store/_open.py chooses."""
