"""What is sent and how: workloads, request settings, the traffic a config declares, arrivals, the
Locust user and its processes, running endpoints, and vLLM's serving benchmark (the second client)."""
