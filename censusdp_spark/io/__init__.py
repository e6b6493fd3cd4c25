"""Input readers (validated at the door) and Delta Lake writers."""
