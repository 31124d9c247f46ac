"""Training inputs: the input protocols, in-memory and store inputs, shards, and sample/class weights."""
