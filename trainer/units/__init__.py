"""The process mains: a learner's and a syncer shard's hosts, the warm spare, what they share
(shell) and the JSONL event writer."""
