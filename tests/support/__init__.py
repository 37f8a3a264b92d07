"""What the tests share: helpers, played peers (agents, a Redis server, a
browser), and the task modules that workers import by name."""
