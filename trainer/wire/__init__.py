"""The wire: frames (codec), the membership exchange (auth), TCP links and their delivery
window (transport, shard_link, flow)."""
