"""Input readers (validated at the door), the P.L. 94-171 legacy layout, and Delta Lake tables."""
