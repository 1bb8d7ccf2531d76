"""PACER's pre-verification layer: features, data collection, the layer, training and the draft-length policy."""
