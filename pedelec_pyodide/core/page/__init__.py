"""One page's connection: the sans-I/O protocol object (:mod:`.connection`), the thin
WebSocket loop around it (:mod:`.bridge`), the WebSocket protocol under it
(:mod:`.ws_limits`), and the bounds per connection and per client it draws on."""
