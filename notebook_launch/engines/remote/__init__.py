"""What every engine whose ranks connect back from other machines shares."""
