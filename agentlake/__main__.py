from agentlake.cli import app

app()
