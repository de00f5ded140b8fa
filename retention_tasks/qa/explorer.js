// The explorer page's view of extractive QA (served in /explorer/views.js; service/static/explorer.js).
VIEWS.qa = {
  title: "Answer",
  question: true,
  textLabel: "Context",
  shade(explanation, body, of, layers) {
    shade($("question-shaded"), "Question", $("question").value, of("question"), layers, null);
    const answer = body.results[0];
    shade($("shaded"), "Context", $("text").value, of("context"), layers, answer);
  },
  result(body, box) {
    box.appendChild(element("div", body.answer || "(no answer)", "label"));
    box.appendChild(element("div", `score ${body.score.toFixed(4)}, characters ${body.start}-${body.end} of the context`));
  },
};
