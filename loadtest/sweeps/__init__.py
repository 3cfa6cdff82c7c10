"""The runs: the closed- and open-loop sweep and its plan, the capacity search, the sweep over
temperatures. They start the servers, drive traffic, measure, and hand results to the reports."""
