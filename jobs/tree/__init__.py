"""The repository on disk: git run safely (``git``), the cached mirrors and the loop's
worktree (``worktree``), and the tree's files as the harness reads them (``files``)."""
