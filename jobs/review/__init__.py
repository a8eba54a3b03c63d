"""Review and merge: the critic (``critic``, its ``prompt``, its read-only ``tools`` on a
``checkout`` of the pull request) and the merge gate (``gate``)."""
