from engine.cli import entry

entry()
