"""Batch HTTP routes (speech, images, videos) as one-shot sessions; arriving in later issues."""
