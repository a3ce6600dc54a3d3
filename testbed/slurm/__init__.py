"""lossbed on a Slurm cluster: what runs as root on its nodes (the agent, agent.py; the
Epilog, epilog.py; the admin's policy, policy.py), what a job's processes use to reach it
(client.py), and Slurm's node lists (hostlist.py). The allocation as a Cluster is
testbed/clusters/slurm.py. docs/guides/slurm.md is the admin's and the user's guide."""
