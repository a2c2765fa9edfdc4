// The public API, as the page uses it. Every URL is relative to the page (see index.html).

export class ApiError extends Error {
  constructor(status, body) {
    const err = body?.error ?? {};
    super(err.message || `HTTP ${status}`);
    this.status = status;
    this.code = err.code ?? null;
    this.safety = err.safety ?? null;
    this.body = body;
  }
}

/** fetch + JSON with the OpenAI error shape turned into an ApiError. */
export async function getJson(url, init = {}) {
  const r = await fetch(url, init);
  const text = await r.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = { error: { message: text.slice(0, 300) || `HTTP ${r.status}` } };
  }
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

export const postJson = (url, payload, init = {}) =>
  getJson(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload), ...init });

/** Lists come as {"data": [...]} (OpenAI style) or as bare arrays or {"<key>": [...]}. */
export function listOf(body, key) {
  if (Array.isArray(body)) return body;
  if (Array.isArray(body?.data)) return body.data;
  if (key && Array.isArray(body?.[key])) return body[key];
  return [];
}
