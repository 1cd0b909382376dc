from ralph.engine.entry import main

main()
