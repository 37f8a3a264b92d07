"""An example task module for the containers of docker-compose.yml, which
mount this directory at /tasks (the workers' working directory, so they
import what is here by name).

From this machine: ``pool submit --discovery redis://localhost:6379
--token-file token example:shout hello``.
"""


def shout(text: str) -> str:
    return text.upper() + "!"
