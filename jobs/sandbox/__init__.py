"""The sandbox every command of the agent, verify and setup runs in: bubblewrap
(``bwrap``) with its syscall filter (``seccomp``), a command's process, output and
deadline (``process``), the worktree's walk and disk charge (``disk``), cgroup limits
(``cgroups``), opt-in network egress through a proxy (``egress``, what it lets through:
``egress_policy``), and file access that never follows the worktree's links (``safefs``)."""
