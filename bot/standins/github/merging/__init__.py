"""The local GitHub's merge rules: reviews, conversations, required checks and the merge
queue, as GitHub enforces them."""
