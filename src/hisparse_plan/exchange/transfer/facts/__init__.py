"""What each engine's plan offers a transfer (a rank's tables, heads, states, sharing) and
where each of its bytes lies; imports nothing of the transfer but its errors."""
