// A streamed completion: POST /v1/completions with `stream: true`, read as server-sent events
// (fetch + ReadableStream; EventSource cannot POST).

export interface CompletionRequest {
  prompt: string;
  max_tokens: number;
  temperature: number;
}

export interface StreamEnd {
  finish: string | null;
  pieces: number;
}

/** The message of an OpenAI-style error body, or the status line when the body is not one. */
async function errorOf(resp: Response): Promise<string> {
  const text = await resp.text();
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } };
    if (typeof body.error?.message === 'string') return body.error.message;
  } catch {
    // Not JSON: a proxy's page or a plain-text error; show its start below.
  }
  const start = text.trim().slice(0, 200);
  return `HTTP ${resp.status}${start ? `: ${start}` : ''}`;
}

/** Splits `buffer` into complete events (blank-line separated); returns them and the rest. */
export function splitEvents(buffer: string): [string[], string] {
  const parts = buffer.replace(/\r\n?/g, '\n').split('\n\n');
  const rest = parts.pop() ?? '';
  const data = parts.map((event) =>
    event
      .split('\n')
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5))
      .join('\n'),
  );
  return [data.filter((d) => d !== ''), rest];
}

/**
 * Streams a completion, calling `onText` with each piece as it arrives. Rejects with the API's
 * own error message (a 4xx/5xx body, or an error event inside the stream).
 */
export async function streamCompletion(
  req: CompletionRequest,
  onText: (text: string) => void,
  signal: AbortSignal,
): Promise<StreamEnd> {
  const resp = await fetch('/v1/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify({ ...req, stream: true }),
    signal,
  });
  if (!resp.ok) throw new Error(await errorOf(resp));
  if (!resp.body) throw new Error('the response has no body to stream');
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let finish: string | null = null;
  let pieces = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const [events, rest] = splitEvents(buffer);
    buffer = rest;
    for (const data of events) {
      if (data === '[DONE]') return { finish, pieces };
      const msg = JSON.parse(data) as {
        error?: { message?: string };
        choices?: { text?: string; finish_reason?: string | null }[];
      };
      if (msg.error) throw new Error(msg.error.message ?? 'the node reported an error');
      const choice = msg.choices?.[0];
      if (choice?.text) {
        pieces += 1;
        onText(choice.text);
      }
      if (choice?.finish_reason) finish = choice.finish_reason;
    }
  }
  throw new Error('the stream ended before [DONE]');
}
