"""Tasks built on the Dec-POMDP protocol, each in its own wing."""
