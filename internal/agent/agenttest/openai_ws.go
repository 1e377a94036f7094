package agenttest

import (
	"encoding/json"
	"net/http"

	"github.com/coder/websocket"
)

// The Responses API over a WebSocket, as Codex speaks it (its
// supports_websockets provider option): the client upgrades GET
// .../responses, its key on the handshake, and sends each request as a
// text message, the POST's body with "type": "response.create"; the
// server answers each with the events it would stream as server-sent
// events, one JSON text message each, the last response.completed. The
// connection carries the turn's requests one after another: a later one
// may name the previous response (previous_response_id) and send only the
// input items added since. Codex first sends a prewarm, a response.create
// with "generate": false, and waits for its response.completed. Other
// messages (response.processed, from newer clients) need no answer.

// maxMessage bounds a message read, as readBody bounds a POST's body: a
// request carries the whole conversation and the tools' schemas.
const maxMessage = 32 << 20

// serveWebSocket serves the Responses API over r's WebSocket. The key is
// checked on the handshake, as the API does: a wrong one is answered, and
// recorded, as a POST's would be. An error status of the options answers
// each request instead with an error event carrying it, which Codex reads
// as that HTTP status.
func (o *OpenAI) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	if !o.keyOK(bearerKey(r)) {
		req := OpenAIRequest{Request: newRequest(r, "", false, false, false), WebSocket: true}
		status, _, _ := o.answer(&req, &req.Request, false)
		writeOpenAIError(w, status)
		return
	}
	// Compression stays off (Codex offers permessage-deflate, which a
	// server may decline): what the relay carries is the same either way.
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered the handshake with its error
	}
	defer c.CloseNow()
	c.SetReadLimit(maxMessage)
	// Not r's context: the server no longer tracks a hijacked connection.
	ctx := o.ctx
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return // the client closed, or the endpoint stopped
		}
		if typ != websocket.MessageText {
			c.Close(websocket.StatusUnsupportedData, "want JSON text messages")
			return
		}
		var body responsesBody
		if json.Unmarshal(data, &body) != nil || body.Type != "response.create" {
			continue
		}
		req := o.responsesRequest(r, body)
		req.WebSocket = true
		req.Prewarm = body.Generate != nil && !*body.Generate
		req.Main = req.Main && !req.Prewarm
		status, reply, n := o.answer(&req, &req.Request, req.Main)
		var werr error
		send := func(typ string, data map[string]any) {
			if werr == nil {
				werr = c.Write(ctx, websocket.MessageText, eventJSON(typ, data))
			}
		}
		switch {
		case status != 0:
			ev := map[string]any{"status": status, "error": openAIError(status)}
			if status == http.StatusTooManyRequests {
				ev["headers"] = map[string]any{"retry-after": "0"}
			}
			send("error", ev)
		case req.Prewarm:
			responseEvents(body.Model, Reply{}, n, send)
		default:
			responseEvents(body.Model, reply, n, send)
		}
		if werr != nil {
			return
		}
	}
}
