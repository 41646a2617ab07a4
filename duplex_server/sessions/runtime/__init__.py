"""The asyncio shell around the core: one actor per live session with its
mailbox, the manager (admission, reaper, takeover), hearing (VAD and
transcripts), attachments and the journal window their senders drain."""
