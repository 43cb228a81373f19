from agentlake.entry import main

main()
