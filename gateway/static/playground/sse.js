// Server-Sent Events over fetch(): EventSource cannot POST, and the chat API streams the answer to a POST.
// Parses the text/event-stream format (https://html.spec.whatwg.org/multipage/server-sent-events.html):
// lines end with CRLF, LF or CR; "data:" lines accumulate; an empty line dispatches the event.

/** Yield the data payload (a string) of every event in a fetch Response body. */
export async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buf += done ? decoder.decode() : decoder.decode(value, { stream: true });
      // A trailing CR may be the first half of a CRLF split across reads: keep it for the next round.
      let end = buf.length;
      if (!done && buf.endsWith("\r")) end -= 1;
      const re = /\r\n|\r|\n/g;
      let start = 0;
      let m;
      while ((m = re.exec(buf)) !== null && m.index < end) {
        const line = buf.slice(start, m.index);
        start = m.index + m[0].length;
        if (line === "") {
          if (data.length) yield data.join("\n");
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        }
        // "event:", "id:", "retry:" and ":" comments are not used by this API.
      }
      buf = buf.slice(start);
      if (done) break;
    }
    // Per the spec, an event not closed by a blank line before the end of the stream is discarded.
  } finally {
    reader.releaseLock();
  }
}

/** Yield parsed JSON chunks until "[DONE]". */
export async function* sseJson(response) {
  for await (const data of sseData(response)) {
    if (data === "[DONE]") return;
    yield JSON.parse(data);
  }
}
