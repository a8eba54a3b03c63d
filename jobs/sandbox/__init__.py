"""The sandbox every command of the agent, verify and setup runs in: bubblewrap
(``bwrap``), cgroup limits (``cgroups``), opt-in network egress through a proxy
(``egress``), and file access that never follows the worktree's links (``safefs``)."""
