"""Rules of the pull request: the critic's findings and verdicts, what carries across a
catch-up, code owners, and the merge gate's decision. Pure."""
