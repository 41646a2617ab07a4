"""Audio stages of the engine: voice activity, speech recognition, synthesis.

Each stage loads its model once and serves every session from one worker
thread (the libraries are CPU-bound and not thread-safe), so a slow stage
never blocks the event loop and sessions share one loaded model per stage.
"""
