"""What runs on one host: the host objects, the agent that does lossbed's work there, the lease
watchdog that reverts an impairment, and the guard that stops ranks."""
