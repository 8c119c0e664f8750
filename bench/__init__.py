"""The load harness behind `make bench`: servers, load generators, scenarios and the results table."""
