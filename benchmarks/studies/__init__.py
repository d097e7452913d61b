"""Studies of fedselect's own settings that reproduce no paper (the first comparison, client dropout)."""
