from engine.entry import main

main()
